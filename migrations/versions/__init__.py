"""The catalog's revisions (Alembic skips this file when it reads the folder)."""
