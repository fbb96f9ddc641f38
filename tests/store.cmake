# Stores and the fetch queue (issue 4).
kvtier_add_test(test_stores SOURCES store/test_stores.cpp LABELS unit)
kvtier_add_test(test_fetch_queue SOURCES store/test_fetch_queue.cpp LABELS unit tsan)
