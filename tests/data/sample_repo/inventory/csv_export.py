"""Exporting items."""

import csv


def export_items_to_csv(items, path: str) -> int:
    """Write id, name and quantity of every item to a CSV file; returns the row count."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "name", "quantity"])
        for item in items:
            writer.writerow([item["id"], item["name"], item["quantity"]])
    return len(items)
