"""A schema as PostgreSQL's catalogue prints it, and the schema the ``ddl/`` files declare.

``catalogue`` reads every column, constraint, index, function, trigger, composite type, sequence,
view and table setting of one schema, each as PostgreSQL itself prints its definition
(``pg_get_functiondef``, ``pg_get_triggerdef``, ``pg_get_indexdef``, ``pg_get_constraintdef``,
``pg_get_viewdef``), with runs of whitespace made one space. ``declare`` builds a schema the way
a reader of the files would: the tables from the SQLAlchemy metadata, then each file of ``ddl/``
as written.
Two databases with equal catalogues have the same schema, whichever way each was built.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from sqlalchemy import create_engine

from agentruns.adapters.postgres import schema

DDL = Path(schema.__file__).with_name("ddl")

# Each query answers (object, definition) rows for the schema named by its one parameter.
_QUERIES = {
    "column": """
        SELECT c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0
          AND NOT a.attisdropped""",
    "constraint": """
        SELECT c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s""",
    "index": """
        SELECT i.relname, pg_get_indexdef(i.oid)
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_namespace n ON n.oid = i.relnamespace
        WHERE n.nspname = %s""",
    "function": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %s""",
    "trigger": """
        SELECT c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND NOT t.tgisinternal""",
    "type": """
        SELECT t.typname,
               string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                          ORDER BY a.attnum)
        FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        WHERE n.nspname = %s
        GROUP BY t.typname""",
    "sequence": """
        SELECT c.relname, format_type(s.seqtypid, NULL)
               || COALESCE(' OWNED BY ' || o.relname || '.' || a.attname, '')
        FROM pg_sequence s
        JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass
             AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
        LEFT JOIN pg_class o ON o.oid = d.refobjid
        LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
        WHERE n.nspname = %s""",
    "view": """
        SELECT c.relname, pg_get_viewdef(c.oid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relkind = 'v'""",
    "table setting": """
        SELECT c.relname, array_to_string(c.reloptions, ', ')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.reloptions IS NOT NULL""",
}

# Alembic's own bookkeeping is no part of the schema the files declare.
_ALEMBIC = re.compile(r"\balembic_version")


def _normalised(definition: str) -> str:
    return " ".join(definition.split())


def catalogue(url: str, schema_name: str = "public") -> dict[str, str]:
    """Every object of ``schema_name`` (``"function agent_claim(...)"``, ...) and its definition."""
    found: dict[str, str] = {}
    with psycopg.connect(url) as connection:
        for kind, query in _QUERIES.items():
            for name, definition in connection.execute(query, (schema_name,)):
                if not _ALEMBIC.search(str(name)):
                    found[f"{kind} {name}"] = _normalised(str(definition))
    return found


def differences(migrated: dict[str, str], declared: dict[str, str]) -> list[str]:
    """What one catalogue has that the other has not, or defines otherwise, one line each."""
    lines = []
    for name in sorted(migrated.keys() | declared.keys()):
        if name not in declared:
            lines.append(f"{name}: made by the migrations, in no file of ddl/")
        elif name not in migrated:
            lines.append(f"{name}: in ddl/, made by no migration")
        elif migrated[name] != declared[name]:
            lines.append(
                f"{name}: the migrations make\n    {migrated[name]}\n  ddl/ says\n"
                f"    {declared[name]}"
            )
    return lines


def ddl_files(folder: Path = DDL) -> list[Path]:
    """The files of ``ddl/``, in the order they are read (any order works: the tables come
    first, and no file's statement needs another file's object when it runs)."""
    return sorted(folder.glob("*.sql"))


def declare(url: str, folder: Path = DDL) -> None:
    """Build the declared schema in the empty database at ``url``: the metadata's tables, then
    every file of ``folder``."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        schema.metadata.create_all(engine)
    finally:
        engine.dispose()
    with psycopg.connect(url, autocommit=True) as connection:
        for path in ddl_files(folder):
            connection.execute(path.read_text().encode())
