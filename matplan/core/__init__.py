"""The core every layer stands on: array modules, the problem and its validation, features and
statistics, the device table, the shared types and timing. It imports nothing else of matplan."""
