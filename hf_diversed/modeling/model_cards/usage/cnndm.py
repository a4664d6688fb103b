article = open("article.txt").read()  # the story to summarize (training cut articles to 400 words)
messages = [{"role": "user", "content": (
    'Summarize the following news article in 3 to 4 short sentences that state its key facts. Reply with the summary only.\n'
    '\n'
    'Article:\n'
) + article}]
max_new_tokens = 128  # the length the head was trained and evaluated at
