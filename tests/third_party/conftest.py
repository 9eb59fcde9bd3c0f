# Files here are third-party test code that tests/ runs through its own
# modules (tests/test_tf_contract.py), against the drop-ins; collected on
# their own they would test TensorFlow itself.
collect_ignore_glob = ["*.py"]
