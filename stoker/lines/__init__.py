"""Model lines: nights, parents, promotion, the lease, the gate, evaluation sets and replay."""
