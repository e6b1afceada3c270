"""HTTP-independent API functions."""

from inventory.db import Database


def create_item(db: Database, name: str, quantity: int) -> int:
    """Insert an item and return its id."""
    if quantity < 0:
        raise ValueError("quantity must not be negative")
    cur = db.execute("INSERT INTO items (name, quantity) VALUES (?, ?)", (name, quantity))
    return cur.lastrowid


def delete_item(db: Database, item_id: int) -> bool:
    """Remove an item; False when it did not exist."""
    cur = db.execute("DELETE FROM items WHERE id = ?", (item_id,))
    return cur.rowcount > 0


def list_items(db: Database, page: int = 1, page_size: int = 20) -> list:
    """One page of items ordered by name."""
    offset = (page - 1) * page_size
    rows = db.execute("SELECT id, name, quantity FROM items ORDER BY name LIMIT ? OFFSET ?", (page_size, offset))
    return [dict(r) for r in rows]
