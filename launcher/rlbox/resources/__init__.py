"""Package data, no code: shipped recipes, datasets, failure signatures, stand-ins."""
