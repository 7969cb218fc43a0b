#!/usr/bin/env python3
"""Runs statements the ClickHouse store emitted against current ClickHouse.

Usage: check_current.py STATEMENTS.json  (a JSON array of SQL strings)

The store is tested against Debian's ClickHouse 18.16; users run current
releases. chdb embeds the current engine in-process (`pip install chdb`, done
by deploy/scripts/install-test-deps.sh), so every statement is also checked
here: the schema first, then every query, on empty tables (names, types and
functions are resolved whether or not there are rows). Exits non-zero with
each failing statement and its error.

Cluster-mode statements (docs/storage.md, "On a cluster") are checked for
what one chdb process can run: it has no remote_servers, macros or
ZooKeeper, so `ON CLUSTER` is dropped, a Replicated engine loses its
ZooKeeper path and replica name (the rest of the statement runs), and a
Distributed table is checked by running its sharding key on its local
table rather than created. An `ADD COLUMN` (a migration from an older
schema) runs after the column is dropped.
"""
import json
import re
import sys

try:
    from chdb import session
except ImportError:
    sys.exit("chdb is not installed: run `bash deploy/scripts/install-test-deps.sh` "
             "(it runs `python3 -m pip install chdb`)")


DISTRIBUTED = re.compile(
    r"CREATE TABLE IF NOT EXISTS \S+ \(.*\)\s*"
    r"ENGINE = Distributed\(\w+, (\w+), (\w+), (.*)\)\s*$",
    re.S,
)


def single_node(statement):
    """The part of a cluster-mode statement one process can run."""
    statement = re.sub(r"\s+ON CLUSTER\s+\w+", "", statement)
    statement = re.sub(
        r"ENGINE = Replicated(\w*MergeTree)\('[^']*', '[^']*'(?:, )?",
        r"ENGINE = \1(",
        statement,
    )
    distributed = DISTRIBUTED.match(statement)
    if distributed:
        database, local, key = distributed.groups()
        return f"SELECT {key} FROM {database}.{local} LIMIT 0"
    return statement


ADD_COLUMN = re.compile(r"ALTER TABLE (\S+) ADD COLUMN (\w+) ")


def rank(statement):
    head = statement.lstrip().upper()
    if head.startswith("CREATE DATABASE"):
        return 0
    if head.startswith("CREATE"):
        return 1
    return 2


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        statements = json.load(f)
    s = session.Session()
    version = s.query("SELECT version()", "CSV").bytes().decode().strip().strip('"')
    s.query("CREATE DATABASE IF NOT EXISTS opgraph")
    failures = []
    for statement in sorted(map(single_node, statements), key=rank):
        # The store names tables without a database; its client sends the
        # database with each request, which this session stands in for.
        try:
            s.query("USE opgraph")
            # The store adds a column only to a table made by an older
            # version; the schema here is the newest, so make it older first.
            added = ADD_COLUMN.match(statement)
            if added:
                s.query(f"ALTER TABLE {added[1]} DROP COLUMN IF EXISTS {added[2]}")
            s.query(statement, "CSV")
        except Exception as e:  # chdb raises its own error types
            failures.append(f"{statement}\n  -> {str(e).strip()[:400]}")
    if failures:
        print(f"{len(failures)} of {len(statements)} statements fail on ClickHouse {version}:")
        print("\n\n".join(failures))
        return 1
    print(f"{len(statements)} statements ran on ClickHouse {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
