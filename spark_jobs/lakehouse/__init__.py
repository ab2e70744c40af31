"""The storage layer: every Delta interaction (creating tables, exactly-once appends and
partition replacements, commit labels and txn ids, reading a table's version, commits
and latest rows, the run log, retries on conflict). The only home of Delta's and
Spark's private APIs, each pinned by tests/integration/test_lakehouse_contract.py."""
