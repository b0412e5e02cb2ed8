"""Command-line code above the experiment layer: flags, Gin loading, the distributed launcher."""
