import pytest


@pytest.fixture
def jax_x64():
    """JAX in float64 for the test, as the comparisons in float64 need (the setting is global)."""
    import jax  # only the JAX modules ask for this fixture, and they skip without JAX
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
