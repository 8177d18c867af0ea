"""What the rules share: parameter checks, windows of snapshots, growing columns, statistics, data loaders."""
