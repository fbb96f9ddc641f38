# Stores and the fetch queue (issue 4).
kvtier_add_test(test_stores SOURCES store/test_stores.cpp LABELS unit tsan)
kvtier_add_test(test_fetch_queue SOURCES store/test_fetch_queue.cpp LABELS unit tsan)
kvtier_add_test(test_fetch_queue_put SOURCES store/test_fetch_queue_put.cpp LABELS unit tsan)
kvtier_add_test(test_fetch_queue_model SOURCES store/test_fetch_queue_model.cpp LABELS property tsan)
kvtier_add_test(test_fetch_queue_stress SOURCES store/test_fetch_queue_stress.cpp LABELS unit tsan TIMEOUT 120)
# Against real redis-server processes (one per rank); needs the Asio transport.
if(TARGET kvtier::asio)
  kvtier_add_test(test_store_integration SOURCES store/test_store_integration.cpp LABELS integration
                  LIBS kvtier::asio TIMEOUT 120)
endif()
kvtier_add_test(test_rendezvous_store SOURCES store/test_rendezvous_store.cpp LABELS unit tsan)
# Pinned staging arena (CPU source) and memory_store over its slots (issue 10).
kvtier_add_test(test_pinned_arena SOURCES store/test_pinned_arena.cpp LABELS unit tsan)
# Progress of a running load and pipelined_broadcast driven by it (issue 10).
kvtier_add_test(test_fetch_progress SOURCES store/test_fetch_progress.cpp LABELS unit tsan)
