"""Database backends: ``base`` is the contract, each other folder one database behind it."""
