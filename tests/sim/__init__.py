"""Tests of the simulator (sim/)."""
