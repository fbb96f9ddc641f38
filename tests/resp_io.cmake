# RESP connections, URLs, value header and the remote store (helper "io").
kvtier_add_test(test_redis_harness SOURCES resp_io/test_redis_harness.cpp LABELS integration TIMEOUT 120)
kvtier_add_test(test_url SOURCES resp_io/test_url.cpp LABELS unit)
