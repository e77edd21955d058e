"""Helpers the tests share (not tests themselves): the self-test tree and image, an sshd for
nodes reached over ssh, the workflow test image, and engine bookkeeping."""
