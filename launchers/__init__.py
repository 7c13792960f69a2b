"""ptm launchers: one rendezvous contract (`launchers.rendezvous`) for torchrun, deepspeed and mpirun."""
