"""An example fedasync project: a small CNN of its own, on images it generates."""
