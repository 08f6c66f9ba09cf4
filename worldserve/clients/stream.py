"""`python -m worldserve.clients.stream`: the streaming spec's name for `worldserve stream`."""

from worldserve.clients.streaming import main

if __name__ == "__main__":
    main()
