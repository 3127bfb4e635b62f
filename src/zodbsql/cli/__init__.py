"""The ``zodbsql`` command: one module per tool, each a thin ``main(argv)``."""
