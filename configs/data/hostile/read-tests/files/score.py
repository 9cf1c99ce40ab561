def score(word):
    raise NotImplementedError
