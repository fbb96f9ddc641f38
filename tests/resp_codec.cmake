# RESP codec tests (sans-io encoder and parser).
kvtier_add_test(test_resp_encoder SOURCES resp_codec/test_resp_encoder.cpp LABELS unit)
kvtier_add_test(test_resp_parser SOURCES resp_codec/test_resp_parser.cpp LABELS unit)
kvtier_add_test(test_resp_properties SOURCES resp_codec/test_resp_properties.cpp LABELS property)
