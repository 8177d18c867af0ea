"""Store: the run directory (local or S3), its layout, writers and readers. Every stage goes through here."""
