def square(x):
    """x squared."""
    raise NotImplementedError


def reverse(s):
    """s reversed."""
    raise NotImplementedError


def evens(xs):
    """The even numbers of xs, in order."""
    raise NotImplementedError


def word_count(text):
    """The number of whitespace-separated words in text."""
    raise NotImplementedError
