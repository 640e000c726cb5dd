"""`make soak`: a slotserve process under mixed traffic, faults and reloads, then an audit. See soak/README.md."""
