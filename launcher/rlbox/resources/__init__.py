"""Package data, no code: shipped recipes, datasets, failure signatures, the metric glossary."""
