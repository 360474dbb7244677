"""The `fedasync` command line and the commands on top of the services: up, chaos, acl, devices."""
