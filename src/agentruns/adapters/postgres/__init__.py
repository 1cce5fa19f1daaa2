"""The PostgreSQL adapters: SQLAlchemy Core on psycopg 3, async."""
