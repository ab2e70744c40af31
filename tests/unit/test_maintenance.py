from spark_jobs.jobs.maintenance import may_hold_files_to_vacuum

DAY_MS = 24 * 3_600_000
WEEK_MS = 7 * DAY_MS
NOW_MS = 1_800_000_000_000


def test_a_table_created_within_the_retention_has_no_file_vacuum_could_delete():
    assert not may_hold_files_to_vacuum(NOW_MS - DAY_MS, NOW_MS, WEEK_MS)


def test_a_table_created_exactly_the_retention_ago_has_no_file_older_than_it_yet():
    assert not may_hold_files_to_vacuum(NOW_MS - WEEK_MS, NOW_MS, WEEK_MS)


def test_a_table_created_before_the_retention_may_hold_files_to_delete():
    assert may_hold_files_to_vacuum(NOW_MS - WEEK_MS - 1, NOW_MS, WEEK_MS)


def test_a_table_whose_first_commit_the_log_cleanup_deleted_is_vacuumed():
    assert may_hold_files_to_vacuum(None, NOW_MS, WEEK_MS)
