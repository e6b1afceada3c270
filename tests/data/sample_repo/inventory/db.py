"""A thin wrapper around sqlite3 with migrations."""

import sqlite3

MIGRATIONS = [
    "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, quantity INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS items_name ON items (name)",
]


class Database:
    """Owns one SQLite connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = None

    def connect(self) -> None:
        self.conn = sqlite3.connect(self.url)
        self.conn.row_factory = sqlite3.Row

    def execute(self, sql, params=()):
        if self.conn is None:
            self.connect()
        cur = self.conn.execute(sql, params)
        self.conn.commit()
        return cur

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def migrate(db: Database) -> int:
    """Apply every schema migration in order and return how many ran."""
    for statement in MIGRATIONS:
        db.execute(statement)
    return len(MIGRATIONS)
