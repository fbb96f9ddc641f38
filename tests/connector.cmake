# The engine connector (issue 20): the lifecycle on threads, its properties and faults.
kvtier_add_test(test_connector SOURCES connector/test_connector.cpp LABELS unit tsan)
