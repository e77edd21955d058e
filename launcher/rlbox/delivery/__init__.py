"""Image delivery (`rlbox distribute`, and `rlbox run`'s delivery step): plan.py decides from the
nodes' facts who receives which layers from where along which tree (pure, printable);
execute.py gathers the facts over ssh, carries a plan out and verifies every node by image id;
progress.py shows it. Uses rlbox.cluster (hosts, ssh) and below; rlbox.cluster.execute receives
its step as a function (``deliver=``), so the launcher never imports this package."""
