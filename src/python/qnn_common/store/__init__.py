"""The artifact store: atomic writes, content hashes, locks and staging directories."""
