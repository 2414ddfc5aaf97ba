"""The fixed prompt set every benchmark run uses."""

PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.",
    "Give me a name for a bakery.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "Translate 'good morning' into Spanish and German.",
    "What should I pack for a weekend hike?",
    "Write one sentence about autumn.",
    "How do vaccines work?",
    "Suggest a title for a science fiction novel.",
    "What is the difference between weather and climate?",
    "Tell me a fun fact about octopuses.",
]


def messages(index: int) -> list[dict]:
    return [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]
