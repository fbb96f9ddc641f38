# RESP connections, URLs, value header and the remote store (helper "io").
kvtier_add_test(test_redis_harness SOURCES resp_io/test_redis_harness.cpp LABELS integration TIMEOUT 120)
kvtier_add_test(test_url SOURCES resp_io/test_url.cpp LABELS unit)
kvtier_add_test(test_value_header SOURCES resp_io/test_value_header.cpp LABELS unit property)
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_resp_connection SOURCES resp_io/test_resp_connection.cpp LABELS integration
                  LIBS kvtier::asio kvtier::uring TIMEOUT 120)
endif()
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_remote_store SOURCES resp_io/test_remote_store.cpp LABELS integration
                  LIBS kvtier::asio kvtier::uring TIMEOUT 120)
endif()
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_batch_spread SOURCES resp_io/test_batch_spread.cpp LABELS integration property
                  LIBS kvtier::asio kvtier::uring TIMEOUT 120)
endif()
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_remote_store_threads SOURCES resp_io/test_remote_store_threads.cpp LABELS integration tsan
                  LIBS kvtier::asio kvtier::uring TIMEOUT 120)
endif()
kvtier_add_test(test_conn_resolve SOURCES resp_io/test_conn_resolve.cpp LABELS unit tsan)
kvtier_add_test(test_connection_base SOURCES resp_io/test_connection_base.cpp LABELS unit)
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_slow_resolver SOURCES resp_io/test_slow_resolver.cpp LABELS integration
                  LIBS kvtier::asio kvtier::uring ${CMAKE_DL_LIBS} TIMEOUT 60)
endif()
kvtier_add_test(test_pool SOURCES resp_io/test_pool.cpp LABELS unit tsan)
# A down server fails fast (circuit breaker in connection and pool), against redis-server.
if(TARGET kvtier::asio)
  kvtier_add_test(test_tier_down SOURCES resp_io/test_tier_down.cpp LABELS integration LIBS kvtier::asio
                  TIMEOUT 120)
endif()
# A silent server (black hole, SIGSTOP) trips the pool's breaker on timeouts in a row (issue 27).
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  if(TARGET kvtier::tls)
    kvtier_add_test(test_silent_server SOURCES resp_io/test_silent_server.cpp LABELS integration
                    LIBS kvtier::asio kvtier::uring kvtier::tls TIMEOUT 60)
    if(TARGET test_silent_server)
      target_compile_definitions(test_silent_server PRIVATE KVTIER_TEST_TLS=1)
    endif()
  else()
    kvtier_add_test(test_silent_server SOURCES resp_io/test_silent_server.cpp LABELS integration
                    LIBS kvtier::asio kvtier::uring TIMEOUT 60)
  endif()
endif()
kvtier_add_test(test_cluster SOURCES resp_io/test_cluster.cpp LABELS unit)
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_cluster_store SOURCES resp_io/test_cluster_store.cpp LABELS integration
                  LIBS kvtier::asio kvtier::uring TIMEOUT 300)
endif()
# TLS on both transports (the io_uring one where kvtier::uring_tls is built).
# cluster_store shared by threads while a slot moves (the TSan build runs it too).
if(TARGET kvtier::asio AND TARGET kvtier::uring)
  kvtier_add_test(test_cluster_store_threads SOURCES resp_io/test_cluster_store_threads.cpp
                  LABELS integration tsan LIBS kvtier::asio kvtier::uring TIMEOUT 300)
endif()
if(TARGET kvtier::tls)
  if(TARGET kvtier::uring_tls)
    kvtier_add_test(test_tls SOURCES resp_io/test_tls.cpp LABELS integration LIBS kvtier::tls kvtier::uring_tls
                    TIMEOUT 120)
    if(TARGET test_tls)
      target_compile_definitions(test_tls PRIVATE KVTIER_TEST_URING_TLS=1)
    endif()
  else()
    kvtier_add_test(test_tls SOURCES resp_io/test_tls.cpp LABELS integration LIBS kvtier::tls TIMEOUT 120)
  endif()
endif()
# remote_store with value format 2 (per-group checksums) against redis-server (issue 10).
if(TARGET kvtier::asio)
  kvtier_add_test(test_remote_store_v2 SOURCES resp_io/test_remote_store_v2.cpp LABELS integration
                  LIBS kvtier::asio TIMEOUT 120)
endif()
