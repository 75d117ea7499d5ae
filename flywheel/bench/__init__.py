"""``flywheel bench <suite>``: repeatable side-by-side benchmarks with JSON, Markdown and PNG results."""
