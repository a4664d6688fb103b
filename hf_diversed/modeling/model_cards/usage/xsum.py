article = open("article.txt").read()  # the story to summarize (training cut articles to 400 words)
messages = [{"role": "user", "content": (
    'Summarize the following article in one sentence. Reply with that sentence only.\n'
    '\n'
    'Article:\n'
) + article}]
max_new_tokens = 128  # the length the head was trained at
