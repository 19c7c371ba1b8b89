"""The report's sections, one module per group (a paper's tables, the summary, latency, rack,
inventory); each registers its sections with report.registry in the report's order."""
