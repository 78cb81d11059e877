"""What an item draws: `cases` (the attention case), `strategies` (hypothesis builders of placed examples and their
sizes), `profiles` (kvconform's hypothesis profiles)."""
