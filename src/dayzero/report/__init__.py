"""Reports: turn results into tables, Markdown and JSON files (above validate, below cli)."""
