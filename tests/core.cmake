kvtier_add_test(test_chunker SOURCES core/test_chunker.cpp LABELS unit)
