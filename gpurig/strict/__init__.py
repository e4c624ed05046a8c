"""Reading users' YAML and the grammar of every value they give."""
