"""A seeded generator of simple English children's stories, the training text of the shipped model.

Why generate text instead of downloading it: the course must work offline and the weights must be free
to redistribute, so the corpus is written by this file. A grammar with a few hundred parts gives stories
that are varied enough to learn English-like syntax, and regular enough for a 4M-parameter model to
learn in minutes on a laptop CPU. About a third of the documents are chat turns ("tell me a story about
...") so the chat template and the server lessons have something sensible to say.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = {
    "she": ["Lily", "Mia", "Sara", "Anna", "Emma", "Zoe", "Lucy", "Ella", "Rosa", "Nina", "Amy", "Kate",
            "Maya", "Hana", "Ava", "Ruby", "Sofia", "Grace", "Ivy", "Luna", "Chloe", "Daisy", "Nora",
            "Olivia", "Alice", "Julia", "Clara", "Leah", "Aisha", "Yuki", "Elena", "Holly", "Molly", "Poppy",
            "Sadie", "Willow"],
    "he": ["Tom", "Max", "Ben", "Sam", "Leo", "Jack", "Tim", "Noah", "Finn", "Omar", "Kai", "Leo", "Hugo",
           "Dan", "Eli", "Ravi", "Theo", "Adam", "Jake", "Milo", "Oscar", "Henry", "Lucas", "Ethan", "Felix",
           "Oliver", "Arthur", "Bruno", "Carlos", "Diego", "Ivan", "Jonah", "Kenji", "Louis", "Marco",
           "Peter"],
}
KINDS = {
    "person": ["little girl", "little boy", "young girl", "small boy", "kid"],
    "animal": ["cat", "dog", "bunny", "fox", "bear", "duck", "mouse", "frog", "bird", "turtle", "puppy",
               "kitten", "owl", "lion", "pig", "horse", "squirrel", "penguin", "elephant", "giraffe",
               "monkey", "hedgehog", "goat", "sheep", "cow", "hen", "butterfly", "ladybug", "snail", "whale",
               "dolphin", "zebra", "koala", "panda", "raccoon", "deer", "badger", "otter", "seal", "parrot",
               "wolf"],
    "thing": ["robot", "dragon", "teddy bear", "toy train", "little boat", "snowman", "scarecrow", "unicorn",
              "doll", "dinosaur"],
}
TRAITS = ["kind", "curious", "shy", "brave", "happy", "silly", "clever", "gentle", "busy", "sleepy",
          "friendly", "quiet", "cheerful", "careful", "playful", "grumpy", "tiny", "fluffy", "hungry", "lazy",
          "polite", "proud", "noisy", "lucky", "wise", "smart", "funny", "generous", "honest", "bold"]
PLACES = ["in a small village by the sea", "in a big green forest", "on a quiet farm", "in a busy town",
          "near a tall mountain", "in a little house with a red door", "by a sunny lake",
          "in a park full of trees", "at the edge of a field of flowers", "in a cozy cottage",
          "near an old bridge", "in a garden behind the school", "in a warm burrow under a hill",
          "on a little island", "in a snowy valley", "next to a noisy river", "in a tree house",
          "on a busy street in the city", "near the beach", "in a bright yellow house", "on the moon",
          "in a castle on a hill", "in a quiet meadow", "near a big farm with a windmill"]
OBJECTS = [("ball", "red"), ("kite", "blue"), ("hat", "yellow"), ("book", "old"), ("toy car", "green"),
           ("shell", "shiny"), ("box", "small"), ("key", "gold"), ("cup", "pink"), ("bell", "silver"),
           ("blanket", "soft"), ("map", "big"), ("drum", "loud"), ("flower", "purple"), ("stone", "smooth"),
           ("scarf", "warm"), ("balloon", "orange"), ("whistle", "tiny"), ("puzzle", "colorful"),
           ("crayon", "bright"), ("feather", "white"), ("jar", "glass"), ("necklace", "pretty"),
           ("sock", "striped"), ("umbrella", "black"), ("marble", "glittery"), ("wagon", "wooden"),
           ("bucket", "little"), ("ribbon", "long"), ("lamp", "magic")]
LOST_PLACES = ["under the bed", "behind a big rock", "in the tall grass", "next to the pond",
               "under a pile of leaves", "in the old barn", "on top of a hill", "inside a hollow log",
               "near the garden gate", "in a muddy puddle", "behind the sofa", "in the sandbox",
               "under a bush", "inside the washing basket", "on the roof", "in the toy box",
               "under the kitchen table", "beside the mailbox"]
FOODS = ["cookies", "a cake", "apple pie", "soup", "pancakes", "bread", "a sandwich", "muffins", "a pizza",
         "fruit salad", "banana bread", "carrot soup", "waffles", "lemonade", "a pie with berries",
         "rice with beans", "tacos"]
WEATHER = [("it was raining", "the rain stopped and the sun came out"),
           ("the wind was very strong", "the wind became calm"),
           ("it was snowing", "the snow stopped falling"),
           ("it was very hot", "a cool breeze came"),
           ("dark clouds filled the sky", "the clouds went away")]
FEELINGS_BAD = ["sad", "worried", "scared", "upset", "lonely", "tired", "angry"]
FEELINGS_GOOD = ["happy", "glad", "proud", "excited", "thankful", "calm", "joyful"]
FEARS = [("the dark", "the night"), ("the water", "the lake"), ("loud noises", "the storm"),
         ("high places", "the tall tree"), ("the big dog", "the yard")]
SKILLS = ["swim", "ride a bike", "read", "climb trees", "fly a kite", "sing", "dance", "bake bread", "draw",
          "whistle", "count to one hundred", "tie a knot",
          "skate", "jump rope", "play the piano", "write a letter", "plant seeds", "build a sandcastle",
          "catch a ball"]
LESSONS = {
    "lost": ["it is good to ask friends for help", "looking carefully pays off",
             "friends make hard things easy"],
    "share": ["sharing makes everyone happy", "it feels good to give", "a toy is more fun with a friend"],
    "fear": ["being brave means trying even when you are scared", "fear gets smaller when you face it",
             "a friend can make you feel brave"],
    "skill": ["practice helps you get better", "it is okay to fall and try again",
              "patience and work pay off"],
    "bake": ["good things take time", "working together is fun", "sharing food brings friends together"],
    "weather": ["a bad day can turn into a good day", "you can have fun in any weather",
                "friends make any day bright"],
    "friend": ["a kind word can make a new friend", "everyone needs a friend", "being different is okay"],
}


@dataclass
class Hero:
    name: str
    pron: str  # "he" or "she"
    kind: str
    trait: str

    @property
    def obj(self) -> str:
        return "him" if self.pron == "he" else "her"

    @property
    def poss(self) -> str:
        return "his" if self.pron == "he" else "her"

    @property
    def Pron(self) -> str:
        return self.pron.capitalize()

    @property
    def Poss(self) -> str:
        return self.poss.capitalize()


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def make_hero(rng: random.Random, avoid: str = "") -> Hero:
    pron = rng.choice(["he", "she"])
    name = rng.choice([n for n in NAMES[pron] if n != avoid])
    group = rng.choices(["person", "animal", "thing"], weights=[3, 6, 1])[0]
    kind = rng.choice(KINDS[group])
    if kind == "little girl" or kind == "young girl":
        pron, name = "she", rng.choice([n for n in NAMES["she"] if n != avoid])
    if kind == "little boy" or kind == "small boy":
        pron, name = "he", rng.choice([n for n in NAMES["he"] if n != avoid])
    return Hero(name, pron, kind, rng.choice(TRAITS))


def opening(rng: random.Random, h: Hero) -> str:
    t = h.trait
    return rng.choice([
        f"Once upon a time, there was {article(t)} {t} {h.kind} named {h.name}. {h.Pron} lived "
        f"{rng.choice(PLACES)}.",
        f"One day, {article(t)} {t} {h.kind} called {h.name} was playing {rng.choice(PLACES)}.",
        f"{h.name} was {article(t)} {t} {h.kind} who lived {rng.choice(PLACES)}.",
        f"There once was {article(t)} {t} {h.kind}. {h.Poss} name was {h.name}, and {h.pron} lived "
        f"{rng.choice(PLACES)}.",
    ])


def ending(rng: random.Random, h: Hero, topic: str, friend: Hero) -> str:
    lesson = rng.choice(LESSONS[topic])
    good = rng.choice(FEELINGS_GOOD)
    return rng.choice([
        f"From that day on, {h.name} and {friend.name} were best friends. {h.Pron} learned that {lesson}.",
        f"{h.name} felt very {good}. {h.Pron} knew that {lesson}.",
        f"That night, {h.name} went to bed with a big smile. {h.Pron} had learned that {lesson}.",
        f"{h.name} and {friend.name} laughed and played until the sun went down. The end.",
    ])


def said(rng: random.Random) -> str:
    return rng.choice(["said", "asked", "said", "replied", "called", "whispered", "shouted"])


def story_lost(rng, h, f) -> str:
    thing, color = rng.choice(OBJECTS)
    where = rng.choice(LOST_PLACES)
    bad = rng.choice(FEELINGS_BAD)
    return " ".join([
        opening(rng, h),
        f"{h.Pron} had {article(color)} {color} {thing} that {h.pron} loved very much.",
        f"One morning, {h.name} could not find the {thing}. {h.Pron} looked everywhere, but it was gone.",
        f"{h.name} felt {bad}. Then {h.pron} saw {f.name} the {f.kind}.",
        f'"Have you seen my {color} {thing}?" {h.name} asked.',
        f'"No, but I will help you look," {f.name} {said(rng)}.',
        f"They looked in the kitchen and in the yard. At last, {f.name} found the {thing} {where}.",
        f'"Thank you!" said {h.name}. {h.Pron} gave {f.name} a big hug.',
        ending(rng, h, "lost", f),
    ])


def story_share(rng, h, f) -> str:
    thing, color = rng.choice(OBJECTS)
    return " ".join([
        opening(rng, h),
        f"{h.Pron} had a new {color} {thing}, and {h.pron} did not want anyone else to touch it.",
        f"One day, {f.name} the {f.kind} came by. {f.name} looked at the {thing} and smiled.",
        f'"Can I play with your {thing}?" {f.name} asked.',
        f'"No, it is mine," {h.name} {said(rng)}. {f.name} walked away and looked '
        f'{rng.choice(FEELINGS_BAD)}.',
        f"Soon {h.name} felt {rng.choice(FEELINGS_BAD)} too. Playing alone was not fun at all.",
        f'{h.name} ran after {f.name}. "I am sorry. Let us play with the {thing} together," {h.pron} said.',
        "They took turns and played all afternoon.",
        ending(rng, h, "share", f),
    ])


def story_fear(rng, h, f) -> str:
    fear, where = rng.choice(FEARS)
    return " ".join([
        opening(rng, h),
        f"{h.name} was afraid of {fear}. Every time {h.pron} thought about {where}, "
        f"{h.poss} heart beat fast.",
        f"One day, {h.poss} friend {f.name} the {f.kind} wanted to go to {where}.",
        f'"I am too scared," {h.name} {said(rng)}.',
        f'"Do not worry. I will stay with you," said {f.name}. "We can go slowly."',
        f"{h.name} took a deep breath. Step by step, {h.pron} went with {f.name}.",
        f"It was not so bad after all. {h.name} even started to smile.",
        ending(rng, h, "fear", f),
    ])


def story_skill(rng, h, f) -> str:
    skill = rng.choice(SKILLS)
    return " ".join([
        opening(rng, h),
        f"{h.name} wanted to learn how to {skill}. {h.Pron} tried, but it was very hard.",
        f"The first time, {h.pron} made a mistake. The second time, {h.pron} made another one.",
        f'"I will never learn to {skill}," {h.name} said, and {h.pron} felt {rng.choice(FEELINGS_BAD)}.',
        f'{f.name} the {f.kind} sat down next to {h.obj}. "Try again, a little every day," {f.name} said.',
        f"So {h.name} practiced every day. {h.Pron} tried in the morning and {h.pron} tried after lunch.",
        f"After many days, {h.name} could {skill} all by {h.obj}self.",
        ending(rng, h, "skill", f),
    ])


def story_bake(rng, h, f) -> str:
    food = rng.choice(FOODS)
    return " ".join([
        opening(rng, h),
        f"One day, {h.name} wanted to make {food} for {h.poss} friends.",
        f"{h.Pron} asked {f.name} the {f.kind} to help. \"Yes, I love to cook!\" {f.name} said.",
        f"They got a big bowl. They mixed flour, milk and eggs. {f.name} spilled some flour, and they both "
        "laughed.",
        "They waited and waited. Soon the house smelled warm and sweet.",
        "When everything was ready, they shared it with everyone.",
        f'"This is the best thing I have ever eaten," {said(rng)} {f.name}.',
        ending(rng, h, "bake", f),
    ])


def story_weather(rng, h, f) -> str:
    bad, good = rng.choice(WEATHER)
    return " ".join([
        opening(rng, h),
        f"{h.name} wanted to play outside, but {bad}.",
        f'"Now I cannot go out," {h.pron} said, and {h.pron} felt {rng.choice(FEELINGS_BAD)}.',
        f"Then {f.name} the {f.kind} knocked on the door. \"Let us play a game inside,\" {f.name} said.",
        "They built a fort with pillows and told funny stories. Time went by fast.",
        f"After a while, {good}. {h.name} and {f.name} ran outside together.",
        ending(rng, h, "weather", f),
    ])


def story_friend(rng, h, f) -> str:
    return " ".join([
        opening(rng, h),
        f"{h.name} was new in town and did not have any friends. {h.Pron} felt {rng.choice(FEELINGS_BAD)}.",
        f"One day, {h.pron} saw {f.name} the {f.kind} sitting alone under a tree.",
        f"{h.name} was a little shy, but {h.pron} walked over and said, \"Hello! What is your name?\"",
        f'"My name is {f.name}," said the {f.kind}. "Do you want to play with me?"',
        f"They played {rng.choice(['tag', 'hide and seek', 'with a ball', 'in the sand', 'by the river'])} "
        f"and talked about their favorite things.",
        ending(rng, h, "friend", f),
    ])


TRIPS = [("the beach", "built castles in the sand and splashed in the waves"),
         ("the zoo", "saw tall giraffes and a sleepy lion"),
         ("the mountain", "climbed a rocky path and looked at the clouds below"),
         ("the market", "bought shiny apples and fresh bread"),
         ("the library", "read books about stars and ships"),
         ("the river", "watched the fish and threw small stones"),
         ("the fair", "rode a big wheel and ate sweet candy")]
GIFTS = ["a drawing", "a flower", "a song", "a small cake", "a card", "a paper boat", "a necklace of shells"]


def story_trip(rng, h, f) -> str:
    place, fun = rng.choice(TRIPS)
    thing, color = rng.choice(OBJECTS)
    return " ".join([
        opening(rng, h),
        f"One sunny morning, {h.name} and {f.name} the {f.kind} went on a trip to {place}.",
        f"{h.name} packed {h.poss} {color} {thing} and some snacks.",
        f"At {place}, they {fun}.",
        f"Then {h.name} noticed that {h.poss} {thing} was missing! {h.Pron} felt {rng.choice(FEELINGS_BAD)}.",
        f'"Let us go back and look," said {f.name}. They walked back slowly and looked '
        f'{rng.choice(LOST_PLACES)}.',
        f"There it was! {h.name} picked up the {thing} and smiled.",
        "On the way home, they sang songs and talked about their day.",
        ending(rng, h, "lost", f),
    ])


def story_gift(rng, h, f) -> str:
    gift = rng.choice(GIFTS)
    return " ".join([
        opening(rng, h),
        f"Tomorrow was {f.name}'s birthday, and {h.name} wanted to give {f.name} a present.",
        f"But {h.name} had no money to buy anything. {h.Pron} felt {rng.choice(FEELINGS_BAD)}.",
        f"Then {h.pron} had an idea. {h.Pron} would make {gift} all by {h.obj}self.",
        f"{h.Pron} worked hard all day. It was not perfect, but {h.pron} made it with love.",
        f'The next day, {h.name} gave {f.name} the present. "Happy birthday!" {h.pron} {said(rng)}.',
        f'{f.name} the {f.kind} was so {rng.choice(FEELINGS_GOOD)}. "This is the best gift ever," {f.name} '
        'said.',
        ending(rng, h, "share", f),
    ])


STORIES = {"lost": story_lost, "share": story_share, "fear": story_fear, "skill": story_skill,
           "bake": story_bake, "weather": story_weather, "friend": story_friend, "trip": story_trip,
           "gift": story_gift}
TOPIC_WORDS = {"lost": "a lost toy", "share": "sharing", "fear": "being brave",
               "skill": "learning something new", "bake": "cooking with a friend", "weather": "a rainy day",
               "friend": "making a new friend", "trip": "a day trip", "gift": "a birthday present"}
SYSTEM_PROMPTS = ["You are a friendly storyteller.", "You tell short, happy stories for children.",
                  "You are a helpful assistant who writes simple stories."]


def make_story(rng: random.Random) -> tuple[str, Hero, str]:
    """One story, its hero and its topic (so a chat request can ask for exactly this story)."""
    topic = rng.choice(list(STORIES))
    hero = make_hero(rng)
    friend = make_hero(rng, avoid=hero.name)
    return STORIES[topic](rng, hero, friend), hero, topic


def make_request(rng: random.Random, hero: Hero, topic: str) -> str:
    return rng.choice([
        f"Tell me a story about {article(hero.kind)} {hero.kind} named {hero.name}.",
        f"Can you tell me a short story about {article(hero.trait)} {hero.trait} {hero.kind}?",
        f"Write a story about {TOPIC_WORDS[topic]}.",
        f"Please tell me a story about {hero.name} and {TOPIC_WORDS[topic]}.",
        f"I want a bedtime story about {article(hero.kind)} {hero.kind}.",
        "Tell me a story.",
    ])


def make_document(rng: random.Random, eos: str, chat_fraction: float = 0.3) -> str:
    """A training document: a plain story, or a chat exchange in the shipped chat template's format."""
    story, hero, topic = make_story(rng)
    if rng.random() >= chat_fraction:
        return story + eos
    turns = ""
    if rng.random() < 0.3:
        turns += f"<|system|>\n{rng.choice(SYSTEM_PROMPTS)}\n"
    turns += f"<|user|>\n{make_request(rng, hero, topic)}\n<|assistant|>\n{story}{eos}"
    return turns


def generate_corpus(num_docs: int, seed: int, eos: str = "<|endoftext|>") -> list[str]:
    rng = random.Random(seed)
    return [make_document(rng, eos) for _ in range(num_docs)]


if __name__ == "__main__":
    for doc in generate_corpus(4, seed=0):
        print(doc, "\n")
