"""The ingest half: readers and outlets that turn the engines' streams into records appended to any ordered log."""
