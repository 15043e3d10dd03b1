"""Models and the algorithms that train them."""
