"""One module per `make bench` section; each has a `section_<name>` function that adds rows to the table."""
