"""ckptfix: the independent fixture generator and oracle behind scripts/ckpt_fixture.py."""
