"""Message archives in Parquet: the only part of the package that imports pyarrow.

    parquet   the archive format: `JournalWriter`, `archive_files`, `read_messages`, rows <-> messages
    journal   the daemon's message journal (`[journal]`): records published messages into archives

Importing this package imports nothing; the daemon imports `journal` only when the journal is on.
"""
