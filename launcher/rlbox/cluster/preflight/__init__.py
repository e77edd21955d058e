"""What must pass before anything starts: the verl job's Hydra config (validate) and every
node's facts (doctor)."""
