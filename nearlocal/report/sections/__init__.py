"""The report's own sections, one module per group (a paper's tables, the summary, latency,
inventory, serving); each registers its sections with report.registry in the report's order. A
family's section lives in the family (rack/report_section.py, rdma/report_section.py); all are
found through the entry-point group nearlocal.report_sections."""
