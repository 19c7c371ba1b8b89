"""Reports over stored runs: the papers' tables (`nearlocal report`), compare and acceptance."""
