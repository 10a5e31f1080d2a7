"""The contract clients are written against: the messages and their JSON, the event filters, the
renderer from decoded batches to the events' JSON, and the JSON Schema (docs/protocol.md)."""
