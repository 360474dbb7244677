"""`fedasync up`: the whole system on one machine, a live view, and a run report at the end."""
