"""In-memory adapters: small real implementations, shipped so hosts test without a database."""
