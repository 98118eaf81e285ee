"""SpINA controller: desired state (YAML) -> switch state over P4Runtime. controller/README.md."""
