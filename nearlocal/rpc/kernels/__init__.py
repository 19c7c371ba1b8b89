"""rpc's compiled code (the kernels rule, docs/architecture.md): the ordered words and visibility
protocols (`sync`), the record store's writer and reader (`records`), the slots' client and
server (`slots`). The Python handles on them stay in rpc/records.py and rpc/slots.py."""
